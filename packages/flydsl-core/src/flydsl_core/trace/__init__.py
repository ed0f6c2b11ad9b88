"""Python -> FlyIR tracing."""

from .context import TraceContext, WriteRecorder, current, maybe_current, tracing, user_location

__all__ = ["TraceContext", "WriteRecorder", "current", "maybe_current", "tracing", "user_location"]
