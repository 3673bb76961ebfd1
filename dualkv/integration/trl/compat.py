"""Which TRL releases the GRPOTrainer integration supports, and the check that refuses the others.

The seams (``GRPOTrainer._get_per_token_logps_and_entropies``, ``_generate``, ``_prepare_inputs`` with the module
function ``shuffle_sequence_dict``, ``training_step``/``prediction_step``) were read from, and tested against, TRL
1.16.0; they moved in earlier releases (the fused LM head arrived in 1.x), so other minor series are refused.
"""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

__all__ = ["SUPPORTED_TRL", "TESTED_TRL", "UnsupportedTRLError", "check_trl_version"]

#: Half-open range of TRL versions whose GRPOTrainer seams this package knows.
SUPPORTED_TRL = (Version("1.16.0"), Version("1.17"))
#: The release the CPU tests run against.
TESTED_TRL = "1.16.0"


class UnsupportedTRLError(RuntimeError):
    """TRL is missing or outside :data:`SUPPORTED_TRL`."""


def check_trl_version(version: str | None = None) -> Version:
    """The parsed TRL version; raise :class:`UnsupportedTRLError` naming the supported range otherwise."""
    low, high = SUPPORTED_TRL
    wanted = (f"trl>={low},<{high} (tested with {TESTED_TRL}: `pip install trl=={TESTED_TRL}`, or install dualkv with "
              "its `trl` extra from the repository: `pip install -e '.[trl]'` in a checkout)")
    if version is None:
        try:
            version = metadata.version("trl")
        except metadata.PackageNotFoundError:
            raise UnsupportedTRLError(f"dualkv's TRL integration needs {wanted}, but TRL is not installed") from None
    try:
        found = Version(version)
    except InvalidVersion:
        raise UnsupportedTRLError(f"cannot parse the TRL version {version!r}; dualkv needs {wanted}") from None
    if not (low <= found and Version(found.base_version) < high):  # 0.10.0rc1 / .dev0 belong to 0.10
        raise UnsupportedTRLError(f"dualkv's TRL integration supports {wanted}; found trl {version}. Its GRPOTrainer "
                                  "seams (log-prob call, generation, batch shuffle) differ in other releases")
    return found
