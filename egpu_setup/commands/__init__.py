"""commands: the command-line layer, one module per command; each turns its flags into one typed
options value, makes one core call, prints the result and maps it to an exit code.

Modules: `_cli` (the kit commands are declared with: options, parsing, help), `_complete` (bash
completion from the same declarations), `_options` (shared flags, JSON printing), `detect`,
`record`, `doctor`, `resolve`, `install`, `verify`, `render`, `rollback`, `eject`, `profiles`,
`matrix`, `bundle`, `report`, `firstboot` (a lab image's first boot).
"""
