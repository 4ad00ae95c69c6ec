"""The custom resources' API coordinates: group, version, plurals and kinds (one place)."""

from __future__ import annotations

GROUP = "packrat.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "packratmodels"
KIND = "PackratModel"
PIPELINE_PLURAL = "packratpipelines"
PIPELINE_KIND = "PackratPipeline"
POOL_PLURAL = "packratpools"
POOL_KIND = "PackratPool"
