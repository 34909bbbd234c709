"""The live runner: `python -m triage SCRIPT` supervises the script in a child process and triages what kills it.

The parent (`supervisor`, standard library only) starts fast, forwards signals,
watches a heartbeat for hangs and reports deaths by signal; the child (`child`)
runs the script with runpy semantics, feeds progress hooks (`hooks`) and turns
an exception into a report while the state is still alive (`pipeline`).
"""
