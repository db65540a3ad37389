"""GPU profiles: declarative descriptions of one eGPU model, loaded strictly.

A profile is YAML: profiles/*.yaml shipped in the package (egpu_setup.profile_files),
/etc/egpu-setup/profiles, the user's config directory, or any path.

Modules: `types` (the frozen Profile), `problems` (positions and messages), `strict_yaml` (YAML with
positions, refusing what safe_load lets slip), `schema` (the JSON Schema interpreter), `search`
(the search path), `document` (one file checked alone), `extends` (`extends:` chains), `load`
(load_profile: all of it, plus the cross-field rules).
"""
