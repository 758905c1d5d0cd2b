"""The head's page (`GET /`): the document, one bar per GPU, the usage section and the
inline assets with their hashes."""
