"""The driver's errors: each names what went wrong and what to do next."""
from __future__ import annotations


class DriverError(RuntimeError):
    """Base class of the driver's errors."""


class DeviceBusy(DriverError):
    """A run was requested while the accelerator was still busy."""


class AcceleratorTimeout(DriverError, TimeoutError):
    """No ``ap_done`` within the timeout; ``status`` holds the registers read then."""

    def __init__(self, message, status: dict):
        super().__init__(message)
        self.status = status


class AcceleratorError(DriverError):
    """The accelerator finished with an error status (config_error, addr_fault, axi_error)."""

    def __init__(self, message, status: dict):
        super().__init__(message)
        self.status = status
