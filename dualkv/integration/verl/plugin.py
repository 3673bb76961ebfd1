"""The ``verl.plugins`` entry point: veRL imports this module from ``import verl`` in every process (driver and Ray
workers), which installs the dualkv patches (:func:`dualkv.integration.verl.enable`).

veRL swallows plugin errors (logged at debug level), so an unsupported veRL is reported here as a warning; a
config with ``use_dualkv=true`` then fails with the full error when it is built.
"""

from __future__ import annotations

import warnings

from .compat import UnsupportedVerlError
from .patches import enable

try:
    enable()
except UnsupportedVerlError as err:  # pragma: no cover - exercised with a fake version in the tests
    warnings.warn(f"dualkv veRL plugin not installed: {err}", RuntimeWarning, stacklevel=2)
