"""Tools run by make targets or by hand (bench, compat, fuzz, soak, reliability, install-ends,
recordings): not tests, kept out of the test files' way."""
