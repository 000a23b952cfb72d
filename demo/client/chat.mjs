// A short conversation through nginx with the OpenAI Node client: every turn
// carries the same X-Session-ID (defaultHeaders), so every turn lands on the
// replica that holds the conversation's KV cache.  Prints the replica, the
// session id nginx echoed, and the prompt tokens served from cache; then
// what it measured: on which replicas the turns landed, and how much of the
// later turns' prompts the cache served.
//
//   node chat.mjs http://127.0.0.1:PORT/v1 [session-id]

import OpenAI from 'openai';
import { say } from './say.mjs';

const baseURL = process.argv[2];
if (!baseURL) {
    console.error('usage: node chat.mjs BASE_URL [SESSION_ID]');
    process.exit(2);
}
const sessionId = process.argv[3] ?? `demo-${Date.now()}`;

const client = new OpenAI({
    baseURL,
    apiKey: 'not-needed-for-the-mock',
    defaultHeaders: { 'X-Session-ID': sessionId },
});

const system = 'You are a concise assistant for an inference platform team. '
    .repeat(40);
const messages = [{ role: 'system', content: system }];
const questions = [
    'What does a KV cache hold?',
    'Why does routing a conversation to one replica help?',
    'And what happens when that replica is overloaded?',
];

const replicas = [];
let laterCached = 0;
let laterPrompt = 0;

for (const [turn, question] of questions.entries()) {
    messages.push({ role: 'user', content: question });

    const { data, response } = await client.chat.completions
        .create({ model: 'mock-llm', messages, max_tokens: 40 })
        .withResponse();

    const answer = data.choices[0].message.content;
    const cached = data.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    const replica = response.headers.get('x-replica');
    replicas.push(replica);
    if (turn > 0) {
        laterCached += cached;
        laterPrompt += data.usage.prompt_tokens;
    }
    console.log(`  turn ${turn + 1}: replica=${replica}`
        + ` echoed X-Session-ID=${response.headers.get('x-session-id')}`
        + ` prompt_tokens=${data.usage.prompt_tokens} cached=${cached}`);

    messages.push({ role: 'assistant', content: answer });
}

// Worded from what happened, whichever replica the session's hash chose.
const distinct = [...new Set(replicas)];
const where = distinct.length === 1
    ? `all ${replicas.length} turns on ${distinct[0]}`
    : `turns on ${replicas.join(', ')}`;
const percent = laterPrompt
    ? ` (${Math.round((100 * laterCached) / laterPrompt)}%)` : '';
console.log();
say(`Measured: ${where}; the later turns found`
    + ` ${laterCached.toLocaleString('en')} of`
    + ` ${laterPrompt.toLocaleString('en')} prompt tokens${percent} in cache.`);
