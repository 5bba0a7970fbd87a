"""Glue for training libraries. Each submodule imports its library, so import the one you use:
`from flatcollate.integrations.trl import FlatSFTTrainer`.

Imports from flatcollate: `_conventions`, `boundaries`, `families`, `collate`, `data`, `modeling`, `vision`,
`preference`.
"""
