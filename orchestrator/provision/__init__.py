"""Putting things on the nodes before a launch: the model (sync/) and the software (bootstrap/)."""
