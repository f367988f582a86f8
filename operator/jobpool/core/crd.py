"""The JobWorkerPool custom resource's API coordinates, spelled once: the operator's watch,
the manifests it writes, the pool file format and the CRD file all use these."""

from __future__ import annotations

GROUP = "jobs.mdm.io"
"""The CRD's API group; also the prefix of the operator's labels and annotations."""
VERSION = "v1alpha1"
"""The one served version of the CRD."""
KIND = "JobWorkerPool"
PLURAL = "jobworkerpools"
API_VERSION = f"{GROUP}/{VERSION}"
"""`apiVersion` of a JobWorkerPool (and of a pool file)."""
CRD_NAME = f"{PLURAL}.{GROUP}"
"""The CustomResourceDefinition's name."""
CRD_FILE = f"{CRD_NAME}.yaml"
"""The CRD's file name (in the package's `crds/` folder and the chart's)."""
