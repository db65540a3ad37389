"""data: the knowledge egpu-setup ships, as YAML with a source on every row (and the profile
JSON Schema).

The YAML files are the source that people edit and review; the program reads each one's compiled
form, compiled/<name>.json, the same data written by scripts/compile_data.py (the C JSON parser
reads all of them in about a millisecond, the YAML parser needs tens of milliseconds, and every
command starts by reading some). egpu_setup/compat/shipped.py loads them; tests/compat/
test_data_compiled.py fails when a compiled file no longer says what its YAML says.
"""
