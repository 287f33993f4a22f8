#!/usr/bin/env node
// Reads virtual tags once from the outrun OPC UA server and prints them:
//   node read-once.mjs opc.tcp://localhost:4840/UA/outrun [Tank1.Level Tank1.Volume ...]
// node-opcua writes its warnings to stdout: keep stdout for the values.
const out = process.stdout.write.bind(process.stdout);
process.stdout.write = (chunk, enc, cb) => process.stderr.write(chunk, enc, cb);
const { OPCUAClient, AttributeIds, MessageSecurityMode, SecurityPolicy } = await import('node-opcua');

const [endpoint = 'opc.tcp://localhost:4840/UA/outrun', ...ids] = process.argv.slice(2);
const tags = ids.length ? ids : ['Tank1.Level', 'Tank1.Volume'];
const client = OPCUAClient.create({
  endpointMustExist: false,
  securityMode: MessageSecurityMode.None,
  securityPolicy: SecurityPolicy.None,
  connectionStrategy: { maxRetry: 3, initialDelay: 200, maxDelay: 1000 },
});
await client.connect(endpoint);
const session = await client.createSession();
const ns = (await session.readNamespaceArray()).indexOf('urn:outrun:tags');
for (const id of tags) {
  const dv = await session.read({ nodeId: `ns=${ns};s=${id}`, attributeId: AttributeIds.Value });
  const v = dv.value.value;
  out(`${id} = ${v === null ? '(none)' : v} [${dv.statusCode.name}] source ${dv.sourceTimestamp?.toISOString() ?? '-'} (ns=${ns};s=${id})\n`);
}
await session.close();
await client.disconnect();
