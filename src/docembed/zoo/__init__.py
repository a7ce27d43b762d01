"""The model zoo's package data: one folder per shipped model (config.json, overlay.safetensors, card.md,
check.json and the family's base files). Loading lives in `docembed.models.zoo`, the export that makes these
folders in `docembed.zoo.export`; docs/zoo/README.md describes the layout."""
