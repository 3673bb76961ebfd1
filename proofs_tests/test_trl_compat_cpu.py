"""The TRL integration's refusals that need no TRL (the main environment has none: veRL 0.9.1 breaks beside TRL 1.16,
so TRL's own tests run in a third environment, ``make test-trl``)."""

from importlib import metadata

import pytest

import dualkv.integration.trl as dualkv_trl


def _no_trl(monkeypatch):
    real = metadata.version

    def version(name):
        if name == "trl":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)


def test_the_drop_in_trainer_without_trl_names_the_supported_range(monkeypatch):
    """``from dualkv.integration.trl import DualKVGRPOTrainer`` without TRL raised a bare ModuleNotFoundError; it now
    raises UnsupportedTRLError, as ``apply_dualkv`` does, with the install line that works for this repository."""
    _no_trl(monkeypatch)
    with pytest.raises(dualkv_trl.UnsupportedTRLError, match="TRL is not installed") as exc:
        dualkv_trl.DualKVGRPOTrainer  # noqa: B018
    message = str(exc.value)
    assert f"trl=={dualkv_trl.TESTED_TRL}" in message and "pip install -e '.[trl]'" in message
    assert "pip install 'dualkv[trl]'" not in message   # dualkv is not on a package index
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        dualkv_trl.NoSuchName  # noqa: B018


def test_unsupported_versions_are_refused_by_range():
    for version, match in (("1.15.2", "found trl 1.15.2"), ("1.17.0", "found trl 1.17.0"), ("x.y", "cannot parse"),
                           ("1.17.0rc1", "found trl 1.17.0rc1"), ("1.17.0.dev0", "found trl 1.17.0.dev0")):
        with pytest.raises(dualkv_trl.UnsupportedTRLError, match=match):
            dualkv_trl.check_trl_version(version)
    assert str(dualkv_trl.check_trl_version("1.16.3")) == "1.16.3"
