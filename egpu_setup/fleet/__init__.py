"""fleet: many machines' reports as one table.

Modules: `report` (collect, text table, HTML page).
"""
