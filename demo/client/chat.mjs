// A short conversation through nginx with the OpenAI Node client: every turn
// carries the same X-Session-ID (defaultHeaders), so every turn lands on the
// replica that holds the conversation's KV cache.  Prints the replica, the
// session id nginx echoed, and the prompt tokens served from cache.
//
//   node chat.mjs http://127.0.0.1:18080/v1 [session-id]

import OpenAI from 'openai';

const baseURL = process.argv[2] ?? 'http://127.0.0.1:18080/v1';
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

for (const [turn, question] of questions.entries()) {
    messages.push({ role: 'user', content: question });

    const { data, response } = await client.chat.completions
        .create({ model: 'mock-llm', messages, max_tokens: 40 })
        .withResponse();

    const answer = data.choices[0].message.content;
    const cached = data.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    console.log(`  turn ${turn + 1}: replica=${response.headers.get('x-replica')}`
        + ` echoed X-Session-ID=${response.headers.get('x-session-id')}`
        + ` prompt_tokens=${data.usage.prompt_tokens} cached=${cached}`);

    messages.push({ role: 'assistant', content: answer });
}
