"""Multi-launch modules: the declaration contract (decl), the stitcher, the build driver and compiled-artifact
store (compile), and what runs the artifacts (devices, executor, emulator, doctor)."""
