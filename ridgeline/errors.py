"""Errors that cross layer boundaries. Each maps to an OpenAI-style error body at the server."""


class RidgelineError(Exception):
    """Base class. `status` is the HTTP status the server answers with."""

    status = 500
    type = "internal_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidRequestError(RidgelineError, ValueError):
    status = 400
    type = "invalid_request_error"


class PromptTooLongError(InvalidRequestError):
    def __init__(self, num_tokens: int, max_model_len: int, param: str = "prompt"):
        super().__init__(
            f"prompt is {num_tokens} tokens, over this model's maximum context length "
            f"of {max_model_len} tokens (max_model_len); shorten the prompt",
            param=param,
            code="context_length_exceeded",
        )
        self.num_tokens = num_tokens
        self.max_model_len = max_model_len


class ModelLoadError(RidgelineError):
    """Model spec cannot be resolved or its files are missing, truncated or unsupported."""

    status = 400
    type = "model_error"


class UnsupportedArchitectureError(ModelLoadError):
    pass


class RankFailedError(RidgelineError):
    """A tensor-parallel rank died or a collective failed: the server fails what is in flight and exits."""

    status = 503
    type = "server_error"
