"""Which TRL releases the GRPOTrainer integration supports, and the check that refuses the others.

The seams (``GRPOTrainer._get_per_token_logps_and_entropies``, ``_generate``, ``_prepare_inputs`` with the module
function ``shuffle_sequence_dict``, ``training_step``/``prediction_step``) were read from, and tested against, TRL
1.16.0; they moved in earlier releases (the fused LM head arrived in 1.x), so other minor series are refused.
"""

from __future__ import annotations

from packaging.version import Version

from ..releases import SupportedReleases, installed_version

__all__ = ["SUPPORTED_TRL", "TESTED_TRL", "UnsupportedTRLError", "check_trl_version"]

#: Half-open range of TRL versions whose GRPOTrainer seams this package knows.
SUPPORTED_TRL = (Version("1.16.0"), Version("1.17"))
#: The release the CPU tests run against.
TESTED_TRL = "1.16.0"
_RELEASES = SupportedReleases("trl", "TRL", *SUPPORTED_TRL, TESTED_TRL, "trl",
                              "Its GRPOTrainer seams (log-prob call, generation, batch shuffle) differ in other releases")


class UnsupportedTRLError(RuntimeError):
    """TRL is missing or outside :data:`SUPPORTED_TRL`."""


def check_trl_version(version: str | None = None) -> Version:
    """The parsed TRL version (None: the installed one's); raise :class:`UnsupportedTRLError` naming the supported
    range otherwise (pre-releases of 1.17 included)."""
    return _RELEASES.check(installed_version("trl") if version is None else version, UnsupportedTRLError)
