"""Records that travel on koordstream's topics, and the code that reads and writes them.

Everything from outside enters through this package: `codec` decodes bytes into immutable,
versioned records (validating every field and naming the one that is wrong), `quantity`
parses Kubernetes quantities, `kube` converts plain Kubernetes v1 Pod and Node manifests, and
`jsonschema` exports the records' JSON Schemas for producers outside the project.
This package depends only on the standard library, orjson and pyyaml.
"""
