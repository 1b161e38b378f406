"""``python -m course_utils diagnose train.py [ARGS...]``: is *your* training waiting for data,
and what helps? The script runs unchanged in a child process (:mod:`.script`) where
:mod:`.probe` times every DataLoader batch; :mod:`.rules` gives the verdict.
"""
from .rules import DATA_BOUND_FRACTION, DiagnoseError, verdict
from .script import OUT_OF_SCOPE, ScriptDiagnosis, diagnose_script, parse_try

__all__ = ["DATA_BOUND_FRACTION", "DiagnoseError", "OUT_OF_SCOPE", "ScriptDiagnosis",
           "diagnose_script", "parse_try", "verdict"]
