// Drives the published Node client of the Segment HTTP Tracking API, @segment/analytics-node,
// against a running system, as a team's server would: messages batched and flushed by the
// client, then closed. Usage: node node_sdk.mjs HOST WRITE_KEY RUN (NODE_PATH names the
// folder the client is installed in). Prints a JSON object: `errors` (what the client
// reported; empty when every message was accepted).
import { createRequire } from 'node:module';

const require = createRequire(process.env.NODE_PATH + '/');
const { Analytics } = require('@segment/analytics-node');

const [host, writeKey, run] = process.argv.slice(2);
const errors = [];
const analytics = new Analytics({ writeKey, host, flushAt: 10, flushInterval: 200, maxRetries: 3 });
analytics.on('error', (error) => errors.push(String(error?.reason ?? error?.message ?? error)));

analytics.identify({
  userId: `node-${run}`,
  anonymousId: `anon-node-${run}`,
  traits: { email: `node-${run}@example.com`, firstName: 'Node', plan: 'pro' },
  messageId: `${run}-n1`,
});
analytics.track({
  userId: `node-${run}`,
  event: 'Order Completed',
  properties: { amount: 7, item: 'mug' },
  messageId: `${run}-n2`,
});
analytics.page({ anonymousId: `anon-node-${run}`, name: 'Home', properties: { path: '/' }, messageId: `${run}-n3` });
analytics.group({ userId: `node-${run}`, groupId: `globex-${run}`, traits: { name: 'Globex' }, messageId: `${run}-n4` });
analytics.alias({ previousId: `later-node-${run}`, userId: `node-${run}`, messageId: `${run}-n5` });
await analytics.closeAndFlush({ timeout: 20000 });
console.log(JSON.stringify({ errors }));
