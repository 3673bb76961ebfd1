"""Which veRL releases this integration supports, and the check that refuses the others.

The patch points (``FSDPEngineWithLMHead.forward_step``, ``prepare_micro_batches`` imported by name into
``transformer_impl``, the two trainers' ``_balance_batch``) were read from, and tested against, veRL 0.9.1; they
moved between 0.7 and 0.8 and may move again, so any other minor series is refused with an error rather than
patched blindly.
"""

from __future__ import annotations

from packaging.version import Version

from ..releases import SupportedReleases, installed_version

__all__ = ["SUPPORTED_VERL", "TESTED_VERL", "UnsupportedVerlError", "check_verl_version", "exit_unless_supported_verl",
           "installed_verl_version"]

#: Half-open range of veRL versions whose patch points this package knows: >= 0.9.1, < 0.10.
SUPPORTED_VERL = (Version("0.9.1"), Version("0.10"))
#: The release the CPU test suite runs against.
TESTED_VERL = "0.9.1"
_RELEASES = SupportedReleases("verl", "veRL", *SUPPORTED_VERL, TESTED_VERL, "verl",
                              "Its patch points (engine forward_step, micro-batching, trainer balancing) differ in other "
                              "releases")


class UnsupportedVerlError(RuntimeError):
    """veRL is missing or outside :data:`SUPPORTED_VERL`."""


def installed_verl_version() -> str | None:
    """The installed veRL distribution's version string, or None when veRL is not installed."""
    return installed_version("verl")


def check_verl_version(version: str | None = None) -> Version:
    """Return the parsed veRL version (None: the installed one's); raise :class:`UnsupportedVerlError` naming the
    supported range otherwise (pre-releases of 0.10 included)."""
    return _RELEASES.check(installed_verl_version() if version is None else version, UnsupportedVerlError)


def exit_unless_supported_verl(program: str) -> None:
    """For command-line programs that drive veRL (``experiments/verl``): SystemExit with :func:`check_verl_version`'s
    message, prefixed by ``program``, when veRL is missing or unsupported, instead of an import traceback later."""
    try:
        check_verl_version()
    except UnsupportedVerlError as err:
        raise SystemExit(f"{program}: {err}") from None
