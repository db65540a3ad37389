"""bundle: offline bundles, built once for a lab and installed with no network.

Modules: `builder` (format, wheel closure, downloader).
"""
