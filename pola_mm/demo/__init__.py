"""The embedded demo's dataset: synthetic COCO-format shapes
(:mod:`.shapes`, numpy and PIL only; ``tools/misc/make_shapes_dataset.py``,
``make demo``)."""
