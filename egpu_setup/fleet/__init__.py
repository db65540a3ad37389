"""fleet: many machines' install/verify reports as one table, one page, one exit code.

Modules: `load` (finding the files under the folders given, parsing reports and identity.json),
`identity` (which machine each report is from: the collection folder and the machine id, never
the hostname alone), `expected` (the link's ceiling, H2D and TFLOPS against what they should
reach), `term` (the health sampler's term and the kernels check beside the reports),
`enclosures` (the machines grouped by the Thunderbolt box their eGPU sat in), `rows` (one
truthful row per machine, the summary, `collect`), `text` (the terminal table), `svg` (the
charts), `html` (the self-contained page).
"""
