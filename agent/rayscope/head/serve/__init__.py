"""The head's two ports as transport: the HTTP port and what each path answers, the report port's frames."""
