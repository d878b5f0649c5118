// Validate Grafana dashboard JSON files against the `Dashboard` type of @grafana/schema.
//
// @grafana/schema is Grafana's own published schema library, generated from the CUE dashboard
// kind in grafana/grafana (packages/grafana-schema). It ships TypeScript types, not JSON Schema,
// so ts-json-schema-generator turns the Dashboard interface into a draft-07 JSON Schema (unknown
// properties rejected, as the type allows none) and Ajv validates each file against it.
//
// usage: node validate.mjs DASHBOARD.json...   -> prints one JSON report per file, exit 1 if any
//        node validate.mjs --print-schema       -> prints the generated schema
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";

import Ajv from "ajv";
import { createGenerator } from "ts-json-schema-generator";

const require = createRequire(import.meta.url);
const pkgDir = dirname(require.resolve("@grafana/schema/package.json"));
const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));

const schema = createGenerator({
  path: join(pkgDir, "dist/types/raw/dashboard/x/types.gen.d.ts"),
  type: "Dashboard",
  skipTypeCheck: true,
  additionalProperties: false,
}).createSchema("Dashboard");
schema.$comment = `generated from @grafana/schema ${pkg.version}, type Dashboard`;

const args = process.argv.slice(2);
if (args[0] === "--print-schema") {
  process.stdout.write(JSON.stringify(schema, null, 2) + "\n");
  process.exit(0);
}

const ajv = new Ajv({ allErrors: true, strict: false });
const validate = ajv.compile(schema);
let failed = false;
for (const file of args) {
  const ok = validate(JSON.parse(readFileSync(file, "utf8")));
  failed ||= !ok;
  process.stdout.write(JSON.stringify({
    file,
    schema: `@grafana/schema@${pkg.version}`,
    valid: ok,
    errors: (validate.errors ?? []).map((e) => ({ path: e.instancePath, message: e.message, params: e.params })),
  }) + "\n");
}
process.exit(failed ? 1 : 0);
