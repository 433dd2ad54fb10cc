"""Deployment: a task's robot-side description (robot_side) and the ONNX file with its policy.json (onnx).

The robot runs what these write with `ksim.runtime` (no JAX); `python -m ksim.sim2sim` runs it in plain MuJoCo.
"""
