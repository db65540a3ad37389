"""resolve: host facts (or what-if inputs), a profile and constraints in; a Resolution out.

Modules: `resolver` (the policy and its result types).
"""
