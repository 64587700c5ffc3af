"""The core of fxpass: pass contract, pipeline, registry, spec, instrumentation, report."""
