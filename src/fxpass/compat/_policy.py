"""How torch's and ExecuTorch's pass managers run, as a policy handed to fxpass's pipeline."""

from __future__ import annotations

from ..core.pipeline import RunPolicy

__all__ = ["PASS_MANAGER"]

#: torch's ``PassManager`` and ExecuTorch's: the manager checks its input itself, runs its
#: check after every pass (changed or not), and its ``steps`` is a cap on the rounds, not a
#: promise of convergence (reaching it is not worth a warning).
PASS_MANAGER = RunPolicy(check_input=False, check_unchanged=True, warn_at_limit=False)
