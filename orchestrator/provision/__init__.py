"""Putting things on the nodes before a launch: the model (model_sync) and the software."""
