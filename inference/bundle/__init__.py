"""The bundle format, NumPy and stdlib only: what an exported policy is on disk and what it promises.

``reader`` opens and checks a bundle (``Bundle``, ``load_bundle``: manifest, schema, hashes, the graph-file rule);
``schema`` and ``manifest.schema.json`` say what a manifest may hold; ``contract`` (with ``contract_layout``,
``toml_fields`` and ``policy_math``) what a policy graph takes and how its outputs become env actions; ``spaces``
whether a contract describes an env; ``tensors`` graph inputs and outputs; ``act_inputs`` what a caller may hand
``Policy.act``; ``recording`` the field recording's chunk format; ``mindir`` a MindIR header; ``v1`` the bundles
written before contracts; ``files`` atomic writes and strict reading of the documents users hand us.
"""

from inference.bundle.files import sha256_file
from inference.bundle.reader import (
    LITE_FORMATS,
    MANIFEST,
    MODES,
    READABLE_VERSIONS,
    SCHEMA,
    SCHEMA_VERSION,
    Bundle,
    BundleError,
    load_bundle,
)

__all__ = [
    "LITE_FORMATS", "MANIFEST", "MODES", "READABLE_VERSIONS", "SCHEMA", "SCHEMA_VERSION", "Bundle", "BundleError",
    "load_bundle", "sha256_file",
]  # fmt: skip
