"""Build driver: declarations -> kernel builders -> stitcher -> (externals, aircc/aiecc) -> cache dir.

Every module is keyed by a content hash: sha256 of the stitched text, the external kernels it links
(fingerprints + Peano flags), its aircc preset (npu), the toolchain versions and BUILD_FORMAT. An
artifact is reused only when the manifest entry has the same key and every file is present with its
recorded sha256; anything else (corrupt manifest, changed builder, new toolchain) rebuilds.

Writes are atomic: a module is built in a temp dir inside the cache dir and moved into place with
os.replace; the manifest is rewritten with temp file + os.replace. A file lock (filelock) on
cache_dir/.lock guards manifest read-modify-write and artifact moves; a per-module lock serialises
concurrent builds of the same module (the second process then finds it up to date).

The command line is `llama-npu compile` (llama_npu.cli); this package is its library.

Five modules: `driver` (build_modules, load_artifacts, module_keys), `keys` (what a key hashes), `store`
(locks, atomic files, manifest entries), `npu` (the Peano + aircc stage) and `report` (BuildReport,
BuildError); the public names are re-exported here.
"""
from multi_launch_builder.compile.driver import build_modules, generate, load_artifacts, module_keys, stitch_text
from multi_launch_builder.compile.keys import BUILD_FORMAT, ExternalRef, externals_for_text, module_key, target_of
from multi_launch_builder.compile.build_report import STAGES, BuildError, BuildReport, ModuleResult
from multi_launch_builder.compile.store import MANIFEST, atomic_write_text, entry_valid, read_manifest

__all__ = ["build_modules", "load_artifacts", "module_keys", "generate", "stitch_text", "BUILD_FORMAT",
           "ExternalRef", "externals_for_text", "module_key", "target_of", "STAGES", "BuildError", "BuildReport",
           "ModuleResult", "MANIFEST", "atomic_write_text", "entry_valid", "read_manifest"]
