"""celldialog's own eval suite: what models get wrong with ``llm_dialog`` (seed 003) and with
tools generally (Dagger's post, seed 004).

Run it: ``celldialog eval evals --models sonnet --attempts 5`` (a real provider, its key
configured), ``--models local`` (the embedded model, offline), or offline on scripts:
``--models scripted:evals.scripts:correct`` passes, ``scripted:evals.scripts:wrong`` fails
(each wrong script makes the mistake its eval is about). ``docs/evals.md`` is the guide.
"""
