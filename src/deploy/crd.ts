/** The InferaCluster CRD; its schema is generated from the zod cluster spec. */
import { CustomResourceDefinition } from "kubernetes-models/apiextensions.k8s.io/v1";
import { stringify } from "yaml";
import { zodToOpenApi } from "./openapi.ts";
import { clusterSpecSchema } from "./spec.ts";

export const CRD_GROUP = "infera.dev";
export const CRD_VERSION = "v1alpha1";
export const CRD_PLURAL = "inferaclusters";
export const CRD_KIND = "InferaCluster";

const condition = {
  type: "object" as const,
  required: ["type", "status"],
  properties: {
    type: { type: "string" as const },
    status: { type: "string" as const, enum: ["True", "False", "Unknown"] },
    reason: { type: "string" as const },
    message: { type: "string" as const },
    lastTransitionTime: { type: "string" as const, format: "date-time" },
    observedGeneration: { type: "integer" as const },
  },
};

export const statusSchema = {
  type: "object" as const,
  properties: {
    observedGeneration: { type: "integer" as const },
    server: {
      type: "object" as const,
      properties: { ready: { type: "integer" as const }, desired: { type: "integer" as const } },
    },
    pools: {
      type: "array" as const,
      items: {
        type: "object" as const,
        properties: {
          model: { type: "string" as const },
          pool: { type: "string" as const },
          role: { type: "string" as const },
          ready: { type: "integer" as const },
          desired: { type: "integer" as const },
        },
      },
    },
    conditions: { type: "array" as const, items: condition },
  },
};

export function buildCrd(): CustomResourceDefinition {
  const crd = new CustomResourceDefinition({
    metadata: { name: `${CRD_PLURAL}.${CRD_GROUP}` },
    spec: {
      group: CRD_GROUP,
      scope: "Namespaced",
      names: { plural: CRD_PLURAL, singular: "inferacluster", kind: CRD_KIND, shortNames: ["ifc"] },
      versions: [
        {
          name: CRD_VERSION,
          served: true,
          storage: true,
          subresources: { status: {} },
          additionalPrinterColumns: [
            { name: "Ready", type: "string", jsonPath: ".status.conditions[?(@.type=='Ready')].status" },
            { name: "Server", type: "integer", jsonPath: ".status.server.ready" },
            { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
          ],
          schema: {
            openAPIV3Schema: {
              type: "object",
              required: ["spec"],
              properties: {
                apiVersion: { type: "string" },
                kind: { type: "string" },
                metadata: { type: "object" },
                // biome-ignore lint/suspicious/noExplicitAny: the models' JSONSchemaProps type is recursive
                spec: zodToOpenApi(clusterSpecSchema) as any,
                status: statusSchema,
              },
            },
          },
        },
      ],
    },
  });
  crd.validate();
  return crd;
}

export function crdYaml(): string {
  return `---\n${stringify(JSON.parse(JSON.stringify(buildCrd().toJSON())), { lineWidth: 0 })}`;
}
