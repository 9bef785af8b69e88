"""JSON Schema -> Grammar: the front end that turns a schema into the one grammar representation
(`json_schema_to_grammar`), registered as the grammar source `--json-schema` (source.py).
convert.py is the entry point; the README's "JSON Schema" section says how the other files
share the work. (Absolute imports: pytest imports this file on its own when it collects the
tests below it.)"""
from course.s08_structured.json_schema.convert import SUPPORTED_FEATURES, UNSUPPORTED_FEATURES, json_schema_to_grammar
from course.s08_structured.json_schema.defaults import SERVING_BOUNDS, DefaultBounds
from course.s08_structured.json_schema.keywords import EmptySchemaError, SchemaError, UnsupportedSchemaError, canonical_json
from course.s08_structured.json_schema.modes import BEST_EFFORT, MODES, STRICT, Relaxer, SchemaWarning
from course.s08_structured.json_schema.source import grammar_from_json_schema  # registers `--json-schema`
from course.s08_structured.json_schema.values import FORMATS, integer_range

__all__ = ["BEST_EFFORT", "FORMATS", "MODES", "SERVING_BOUNDS", "STRICT", "SUPPORTED_FEATURES", "UNSUPPORTED_FEATURES",
           "DefaultBounds", "EmptySchemaError", "Relaxer", "SchemaError", "SchemaWarning", "UnsupportedSchemaError",
           "canonical_json", "grammar_from_json_schema", "integer_range", "json_schema_to_grammar"]
