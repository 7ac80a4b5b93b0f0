"""Pravega support: the controller (gRPC) that official Pravega writers talk to first.

``streams.StreamRegistry`` holds the scopes and streams; ``controller.ControllerServer``
serves them over gRPC. The segment store (the appends themselves) is the ``pravega``
source, which owns and starts the controller. This package's README says how to
regenerate the gRPC modules from ``controller.proto``.
"""
