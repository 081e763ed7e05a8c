"""celldialog's own eval suite: what models get wrong with ``llm_dialog`` (the dialog of
CommonTools' llmDialog, https://github.com/commontoolsinc/labs, which this project
reproduces) and with tools generally (the mistakes Dagger's evaluator found,
https://docs.dagger.io/features/llm).

Run it: ``celldialog eval evals --models sonnet --attempts 5`` (a real provider, its key
configured), ``--models local`` (the embedded model, offline), or offline on scripts:
``--models scripted:evals.scripts:correct`` passes, ``scripted:evals.scripts:wrong`` fails
(each wrong script makes the mistake its eval is about). ``docs/evals.md`` is the guide.
"""
