"""The emulator of stitched modules: launch_program (per-launch numpy references) and air_interp (the AIR text
itself)."""
