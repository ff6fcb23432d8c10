"""Which kernel and which CP strategy for a mask, length and GPU count,
from committed measurements where they exist and the calibrated model
where they do not (python -m lcab.advise; docs/guide.md)."""

from lcab.advise.recommend import MAX_MODEL_ERROR_PCT, Question, recommend

__all__ = ["MAX_MODEL_ERROR_PCT", "Question", "recommend"]
