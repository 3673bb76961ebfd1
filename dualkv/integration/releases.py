"""The release gate shared by the trainer integrations (veRL, TRL): one half-open range of supported versions, the
installed distribution's version, and an error that names the range, the tested release and how to install it."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

__all__ = ["SupportedReleases", "installed_version"]


def installed_version(distribution: str) -> str | None:
    """The installed ``distribution``'s version string, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class SupportedReleases:
    """Releases ``low`` <= v < ``high`` of ``distribution`` (``label`` in messages: "veRL", "TRL"), tested with
    ``tested``; ``extra`` is dualkv's install extra for it, ``seams`` what differs in other releases (for the error).
    A pre-release or dev release of ``high`` (0.10.0rc1, 0.10.0.dev0) is outside the range: it belongs to ``high``'s
    series, whose seams were never read."""

    distribution: str
    label: str
    low: Version
    high: Version
    tested: str
    extra: str
    seams: str

    def wanted(self) -> str:
        """The requirement with the tested release and both ways to install it, for messages."""
        return (f"{self.distribution}>={self.low},<{self.high} (tested with {self.tested}: "
                f"`pip install {self.distribution}=={self.tested}`, or install dualkv with its `{self.extra}` extra "
                f"from the repository: `pip install -e '.[{self.extra}]'` in a checkout)")

    def check(self, version: str | None, error: type[Exception]) -> Version:
        """The parsed ``version`` (None: not installed); raise ``error`` naming the range when it is missing,
        unparsable or outside it."""
        if version is None:
            raise error(f"dualkv's {self.label} integration needs {self.wanted()}, but {self.label} is not installed")
        try:
            found = Version(version)
        except InvalidVersion:
            raise error(f"cannot parse the {self.label} version {version!r}; dualkv needs {self.wanted()}") from None
        if not (self.low <= found and Version(found.base_version) < self.high):
            raise error(f"dualkv's {self.label} integration supports {self.wanted()}; found {self.distribution} "
                        f"{version}. {self.seams}")
        return found
