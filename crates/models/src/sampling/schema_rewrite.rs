//! JSON-schema keywords llguidance does not compile, rewritten into ones it does with the
//! same meaning before a schema is compiled.
//!
//! `propertyNames` is the one clients send: zod's `z.record(z.string(), …)` (Claude Code's
//! `TaskCreate` tool, every TypeScript agent SDK) writes `"propertyNames": {"type": "string"}`,
//! and llguidance refuses the whole schema ("Unimplemented keys"). Every JSON object key is a
//! string, so a `propertyNames` that asks only that (or nothing) holds already and is dropped.
//! One that asks for a `pattern`, on an object that declares no `properties` of its own, is
//! the same constraint as `patternProperties: {pattern: <additionalProperties>}` with
//! `additionalProperties: false`. Any other `propertyNames` is left for llguidance to refuse
//! by name: nothing is relaxed.

use serde_json::{Map, Value};

/// Keys whose value maps names to subschemas (the names are not keywords).
const SCHEMA_MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Keys whose value is data, not a schema.
const DATA: [&str; 5] = ["enum", "const", "default", "examples", "required"];

/// Annotations that constrain nothing.
const ANNOTATIONS: [&str; 5] = ["title", "description", "$comment", "examples", "default"];

/// Rewrites every `propertyNames` in `schema` that has an equivalent llguidance compiles.
pub(super) fn rewrite_property_names(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            for (key, child) in object.iter_mut() {
                if SCHEMA_MAPS.contains(&key.as_str()) {
                    if let Value::Object(map) = child {
                        map.values_mut().for_each(rewrite_property_names);
                    }
                } else if !DATA.contains(&key.as_str()) {
                    rewrite_property_names(child);
                }
            }
            rewrite_one(object);
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_property_names),
        _ => {}
    }
}

fn rewrite_one(object: &mut Map<String, Value>) {
    let Some(names) = object.get("propertyNames") else {
        return;
    };
    let names = match names {
        Value::Bool(true) => Map::new(),
        Value::Object(names) => names.clone(),
        _ => return,
    };
    let string_only = names
        .get("type")
        .is_none_or(|kind| kind == "string" || kind == &Value::from(vec!["string"]));
    let constraints: Vec<&str> = names
        .keys()
        .map(String::as_str)
        .filter(|key| *key != "type" && !ANNOTATIONS.contains(key))
        .collect();
    if !string_only {
        return;
    }
    match constraints.as_slice() {
        [] => {
            object.remove("propertyNames");
        }
        ["pattern"]
            if !object.contains_key("properties") && !object.contains_key("patternProperties") =>
        {
            let Some(Value::String(pattern)) = names.get("pattern") else {
                return;
            };
            let values = object
                .remove("additionalProperties")
                .unwrap_or(Value::Bool(true));
            let mut pattern_properties = Map::new();
            pattern_properties.insert(pattern.clone(), values);
            object.remove("propertyNames");
            object.insert(
                "patternProperties".into(),
                Value::Object(pattern_properties),
            );
            object.insert("additionalProperties".into(), Value::Bool(false));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rewritten(mut schema: Value) -> Value {
        rewrite_property_names(&mut schema);
        schema
    }

    #[test]
    fn a_string_only_property_names_is_dropped_where_it_is_a_schema() {
        // Claude Code's TaskCreate `metadata` (zod's record of strings).
        let schema = json!({"type": "object", "properties": {
            "metadata": {"type": "object", "propertyNames": {"type": "string"},
                         "additionalProperties": {}},
            // A property that happens to be called propertyNames stays.
            "propertyNames": {"type": "string"}},
            "required": ["propertyNames"]});
        let out = rewritten(schema);
        assert_eq!(
            out["properties"]["metadata"],
            json!({"type": "object", "additionalProperties": {}})
        );
        assert_eq!(
            out["properties"]["propertyNames"],
            json!({"type": "string"})
        );
        assert_eq!(rewritten(json!({"propertyNames": true})), json!({}));
        assert_eq!(
            rewritten(json!({"propertyNames": {"type": "string", "description": "a key"}})),
            json!({})
        );
        // Data is not walked.
        let data = json!({"const": {"propertyNames": {}}, "enum": [{"propertyNames": {}}]});
        assert_eq!(rewritten(data.clone()), data);
    }

    #[test]
    fn a_key_pattern_becomes_pattern_properties_only_without_declared_properties() {
        let out = rewritten(json!({"type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}}));
        assert_eq!(
            out,
            json!({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "integer"}},
                   "additionalProperties": false})
        );
        let open = rewritten(json!({"propertyNames": {"pattern": "^x"}}));
        assert_eq!(
            open,
            json!({"patternProperties": {"^x": true}, "additionalProperties": false})
        );
        // Declared properties, other key constraints or a non-string type: left for the
        // compiler to refuse by name.
        for kept in [
            json!({"properties": {"a": {}}, "propertyNames": {"pattern": "^a"}}),
            json!({"propertyNames": {"maxLength": 3}}),
            json!({"propertyNames": {"type": "integer"}}),
            json!({"propertyNames": false}),
        ] {
            assert_eq!(rewritten(kept.clone()), kept);
        }
    }
}
