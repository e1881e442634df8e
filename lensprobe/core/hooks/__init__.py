"""Hooks: the one context manager that attaches them and the recorders (:mod:`.attach`), the hook point
every hook receives and its step (:mod:`.hookpoint`), an intervention's declared capabilities
(:mod:`.capabilities`), head and position specs (:mod:`.heads`) and one forward pass (:mod:`.forward`).

May import: :mod:`lensprobe.core.prompts.prompt` and the core's concerns below it.
"""
