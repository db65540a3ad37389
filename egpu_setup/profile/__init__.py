"""GPU profiles: declarative descriptions of one eGPU model, loaded strictly.

Modules: `load` (types, strict YAML, the schema interpreter, the search path, `extends:`).
"""
