// A Responses API conversation through nginx with the OpenAI Node client:
// each turn sends only its new input and previous_response_id, the id of
// the turn before, so the replica that serves it must be the one that
// stored that response (the mock replicas keep responses in memory, as
// vLLM does, and answer 404 elsewhere).  Four turns, the second streamed,
// then responses.retrieve() of the last one; first through nginx with
// response_affinity, then the same conversation through round robin.
//
//   node responses.mjs AFFINITY_BASE_URL ROUND_ROBIN_BASE_URL
//   node responses.mjs http://127.0.0.1:PORT/v1 http://127.0.0.1:RR_PORT/v1
//
// Exits 1 if a request through the module missed its response.

import OpenAI, { NotFoundError } from 'openai';
import { say } from './say.mjs';

const [affinityURL, roundRobinURL] = process.argv.slice(2);
if (!affinityURL) {
    console.error('usage: node responses.mjs AFFINITY_BASE_URL'
        + ' [ROUND_ROBIN_BASE_URL]');
    process.exit(2);
}

const instructions =
    'You are a concise assistant for an inference platform team. '.repeat(40);
const turns = [
    { input: 'What does a KV cache hold?' },
    {
        input: 'Why does routing a conversation to one replica help?',
        stream: true,
    },
    { input: 'And what happens when that replica is overloaded?' },
    { input: 'Summarize that in one sentence.' },
];

// resp_1a2b3c4d...: ids are 37 characters; their start tells them apart.
const short = (id) => (id ? `${id.slice(0, 13)}...` : '-');

function row(label, response, result, showRoute) {
    const replica = response?.headers.get('x-replica') ?? '?';
    const route = showRoute
        ? (response?.headers.get('x-affinity-route') ?? '-').padEnd(14) : '';
    console.log(`  ${label.padEnd(17)} -> ${replica.padEnd(11)}`
        + `${route}${result}`);
}

const cached = (usage) => (usage
    ? `cached ${usage.input_tokens_details?.cached_tokens ?? 0}`
        + ` of ${usage.input_tokens}`
    : '');

// One turn: { id, usage, response } from a stored response, streamed or
// not; the id of a stream is the one its response.created event carries.
async function create(client, params) {
    if (!params.stream) {
        const { data, response } = await client.responses.create(params)
            .withResponse();
        return { id: data.id, usage: data.usage, response };
    }
    const { data: stream, response } = await client.responses.create(params)
        .withResponse();
    let id = null;
    let usage = null;
    for await (const event of stream) {
        if (event.type === 'response.created') id = event.response.id;
        else if (event.type === 'response.completed') {
            usage = event.response.usage;
        }
    }
    return { id, usage, response };
}

// The 404 of a request that reached a replica without the response, as a
// row; any other error is thrown.
function notFound(label, error, showRoute) {
    if (!(error instanceof NotFoundError)) throw error;
    let message = error.error?.message ?? error.message;
    message = message.replace(/resp_[0-9a-f]{8}[0-9a-f]+/g, (id) => short(id));
    row(label, { headers: error.headers }, `${error.status} ${message}`,
        showRoute);
}

// The conversation through baseURL; returns { misses, replicas }: how
// many of its requests got a 404, and the replicas that answered them, in
// order.  After a 404 the next turn continues from the last response the
// client has.
async function conversation(baseURL, showRoute) {
    const client = new OpenAI({
        baseURL, apiKey: 'not-needed-for-the-mock', maxRetries: 0,
    });
    let previous;
    let previousTurn;
    let misses = 0;
    const replicas = [];
    const answered = (response) => {
        replicas.push(response?.headers.get('x-replica') ?? '?');
    };

    for (const [k, turn] of turns.entries()) {
        const label = `turn ${k + 1}${turn.stream ? ' (streamed)' : ''}`;
        const params = {
            model: 'mock-llm', input: turn.input, max_output_tokens: 40,
            ...(previous
                ? { previous_response_id: previous } : { instructions }),
            ...(turn.stream ? { stream: true } : {}),
        };
        try {
            const { id, usage, response } = await create(client, params);
            answered(response);
            row(label, response, `${short(id)}  ${cached(usage)}`, showRoute);
            previous = id;
            previousTurn = k + 1;
        } catch (error) {
            notFound(label, error, showRoute);
            answered({ headers: error.headers });
            misses++;
        }
    }

    const label = `retrieve turn ${previousTurn}`;
    try {
        const { data, response } = await client.responses.retrieve(previous)
            .withResponse();
        row(label, response, `${short(data.id)}  ${data.status}`, showRoute);
        answered(response);
    } catch (error) {
        notFound(label, error, showRoute);
        answered({ headers: error.headers });
        misses++;
    }
    return { misses, replicas };
}

const requests = turns.length + 1;

// '5 requests on 1 replica (replica-2), 0 got a 404': what happened,
// whichever replicas the hash or the rotation picked.
function measured({ misses, replicas }) {
    const distinct = [...new Set(replicas)].sort();
    const on = `${distinct.length} replica${distinct.length === 1 ? '' : 's'}`;
    return `${replicas.length} requests on ${on} (${distinct.join(', ')}),`
        + ` ${misses} got a 404`;
}

console.log(`  through nginx with response_affinity (${affinityURL}):`);
const affinity = await conversation(affinityURL, true);
console.log(`  404s: ${affinity.misses} of ${requests} requests`);

let roundRobin;
if (roundRobinURL) {
    console.log();
    console.log('  the same conversation through round robin'
        + ` (${roundRobinURL}):`);
    roundRobin = await conversation(roundRobinURL, false);
    console.log(`  404s: ${roundRobin.misses} of ${requests} requests`);
}

console.log();
say(`Measured: through the module, ${measured(affinity)}.`
    + (roundRobin ? ` Through round robin, ${measured(roundRobin)}.` : ''));

if (affinity.misses > 0) process.exitCode = 1;
