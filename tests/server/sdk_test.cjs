// xserv-server driven by the official OpenAI Node SDK (npm `openai`, installed by
// run_node_test.sh): chat and completions, streaming and not, usage (with include_usage), stop,
// seed, n, logprobs, and an error surfacing as the SDK's typed error with the right status.
// Usage: node sdk_test.cjs SERVER_BINARY MODEL_DIR
const OpenAI = require("openai");
const { startServer, check, checks } = require("./node_server.cjs");

async function main() {
  const [binary, model] = process.argv.slice(2);
  const server = await startServer(binary, model, ["--api-key", "sdk-key"]);
  const client = new OpenAI({ baseURL: server.url + "/v1", apiKey: "sdk-key", maxRetries: 0 });
  try {
    const models = await client.models.list();
    check(models.data.length === 1 && models.data[0].id === "shakespeare", "models.list", models.data);

    const messages = [{ role: "user", content: "ROMEO:" }];
    const chat = await client.chat.completions.create({
      model: "shakespeare", messages, temperature: 0, max_tokens: 20,
    });
    const text = chat.choices[0].message.content;
    check(chat.object === "chat.completion" && text.length > 0, "chat", chat);
    check(chat.usage.total_tokens === chat.usage.prompt_tokens + chat.usage.completion_tokens, "chat usage", chat.usage);

    // Streaming with include_usage: the same text, then a usage chunk equal to the non-streaming one.
    const stream = await client.chat.completions.create({
      model: "shakespeare", messages, temperature: 0, max_tokens: 20, stream: true,
      stream_options: { include_usage: true },
    });
    let streamed = "";
    let usage = null;
    let finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        streamed += c.delta.content || "";
        if (c.finish_reason) finish = c.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    check(streamed === text, "chat stream == non-stream", { streamed, text });
    check(finish === chat.choices[0].finish_reason, "stream finish_reason", finish);
    check(usage && usage.completion_tokens === chat.usage.completion_tokens &&
          usage.prompt_tokens === chat.usage.prompt_tokens, "stream usage", usage);

    // Completions, streaming and not.
    const comp = await client.completions.create({ model: "shakespeare", prompt: "ROMEO:\n", temperature: 0, max_tokens: 20 });
    check(comp.object === "text_completion" && comp.choices[0].text === text, "completions (plain rendering)", comp);
    let compStreamed = "";
    for await (const chunk of await client.completions.create({
      model: "shakespeare", prompt: "ROMEO:\n", temperature: 0, max_tokens: 20, stream: true,
    })) compStreamed += chunk.choices.map((c) => c.text).join("");
    check(compStreamed === text, "completions stream", compStreamed);

    // stop: the text up to the first occurrence of the stop string.
    const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
    const stopped = await client.chat.completions.create({ model: "shakespeare", messages, temperature: 0, max_tokens: 20, stop });
    check(stopped.choices[0].message.content === text.slice(0, text.indexOf(stop)) &&
          stopped.choices[0].finish_reason === "stop", "stop", { stop, got: stopped.choices[0] });

    // seed: the same seed gives the same sampled text; n gives n choices.
    const sampled = (seed) => client.chat.completions.create({
      model: "shakespeare", messages, temperature: 1, max_tokens: 16, seed,
    }).then((r) => r.choices[0].message.content);
    check((await sampled(5)) === (await sampled(5)), "seed repeats");
    const many = await client.chat.completions.create({
      model: "shakespeare", messages, temperature: 1, max_tokens: 8, n: 3, seed: 1, ignore_eos: true,
    });
    check(many.choices.length === 3 && many.choices.map((c) => c.index).join() === "0,1,2", "n=3", many.choices);
    check(many.usage.completion_tokens === 24, "n=3 usage", many.usage);

    // logprobs in the SDK's types.
    const lp = await client.chat.completions.create({
      model: "shakespeare", messages, temperature: 0, max_tokens: 4, logprobs: true, top_logprobs: 2, ignore_eos: true,
    });
    const content = lp.choices[0].logprobs.content;
    check(content.length === 4 && content.every((t) => t.top_logprobs.length === 2 && t.logprob <= 0), "logprobs", content);

    // Errors: the SDK raises its typed errors with the server's status and message.
    try {
      await client.chat.completions.create({ model: "no-such-model", messages });
      check(false, "unknown model must fail");
    } catch (e) {
      check(e instanceof OpenAI.NotFoundError && e.status === 404, "404 NotFoundError", { status: e.status, msg: e.message });
      check(e.error && e.error.code === "model_not_found", "error body", e.error);
    }
    try {
      await client.chat.completions.create({ model: "shakespeare", messages, temperature: 5 });
      check(false, "bad temperature must fail");
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature", "400 BadRequestError", e.error);
    }
    const wrongKey = new OpenAI({ baseURL: server.url + "/v1", apiKey: "wrong", maxRetries: 0 });
    try {
      await wrongKey.models.list();
      check(false, "wrong key must fail");
    } catch (e) {
      check(e instanceof OpenAI.AuthenticationError && e.status === 401, "401 AuthenticationError", e.status);
    }
    console.log(`sdk_test: ${checks()} checks passed`);
  } finally {
    server.proc.kill("SIGTERM");
  }
}

main().catch((e) => {
  console.error("FAIL:", e);
  process.exit(1);
});
