"""bundle: offline bundles, built once for a lab and installed with no network.

Downloads follow the one-index rule: torch comes through the variant's `--index-url` (or the lab's
mirror of it) with pip's configuration switched off, in a call of its own; the dependencies that
live on the general index come through this machine's own pip configuration in a SEPARATE call.
Never `--extra-index-url`, never both in one resolver run.

Modules: `format` (the manifest `install --bundle` checks), `wheels` (platform tags, metadata, the
dependency closure), `targets` (every Python x distribution, resolved), `builder` (the downloads,
incremental by their inputs).
"""
