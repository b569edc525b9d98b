"""The transport-free request core: the request types every front door converts into, validation, admission."""
