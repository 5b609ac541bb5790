"""OperatorX: time single inference ops through the framework layers serving engines run."""

__version__ = "0.1.0"
__all__ = ["__version__"]
