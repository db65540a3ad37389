"""commands: the Click layer, one module per command; each turns its flags into one typed options
value, makes one core call, prints the result and maps it to an exit code.

Modules: `_options` (shared flags, completion, JSON printing), `detect`, `record`, `doctor`,
`resolve`, `install`, `verify`, `render`, `rollback`, `eject`, `profiles`, `matrix`, `bundle`,
`report`, `firstboot` (a lab image's first boot).
"""
