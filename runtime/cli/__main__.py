"""``python -m runtime.cli``: the same command as the ``celldialog`` console script."""

from . import main

main()
