"""The shipped LLM-TL specs, installed as the package `tlc_specs` (setup.cfg maps it to this folder)
so `tlc.attention` and users find them in a wheel install: `importlib.resources.files("tlc_specs")`."""
