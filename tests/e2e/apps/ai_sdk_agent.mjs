// An app built on the Vercel AI SDK (`ai`): a shell agent in two user turns, each a multi-step
// tool loop, over OpenAI's Responses API (`@ai-sdk/openai`) or Anthropic's Messages API
// (`@ai-sdk/anthropic`). On Responses its second turn sends the first turn's answer back as an
// `item_reference` (the SDK's default while `store` is on).
//
//   AI_SDK_MODULES=<node_modules> node ai_sdk_agent.mjs <base URL> <key> <model> \
//     whole|stream [responses|messages]
//
// The SDK is loaded from AI_SDK_MODULES by path (an ES module resolves bare names only from
// its own folder up), where `.ci/run` installs it.
import { execSync } from "node:child_process";
import path from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.AI_SDK_MODULES;
const load = (name) => import(pathToFileURL(path.join(modules, name, "dist", "index.js")).href);
const { generateText, streamText, stepCountIs, jsonSchema, tool } = await load("ai");
const { createOpenAI } = await load("@ai-sdk/openai");
const { createAnthropic } = await load("@ai-sdk/anthropic");

const [baseURL, apiKey, model, mode, api = "responses"] = process.argv.slice(2);
const language =
  api === "messages"
    ? createAnthropic({ baseURL, apiKey })(model)
    : createOpenAI({ baseURL, apiKey }).responses(model);
const bash = tool({
  description: "Run a shell command and return what it printed.",
  inputSchema: jsonSchema({
    type: "object",
    properties: { command: { type: "string" }, description: { type: "string" } },
    required: ["command"],
  }),
  execute: async ({ command }) => execSync(command, { encoding: "utf8" }),
});

const messages = [
  { role: "user", content: "Print each data file with the shell, one per turn, then say you are done." },
];
for (const ask of [null, "Say again how many files you read."]) {
  if (ask !== null) messages.push({ role: "user", content: ask });
  // An answer's cap as an app sets it: the SDK's default for a model it does not know
  // (128k on Anthropic's) is larger than the scripted model's whole window.
  const options = {
    model: language,
    tools: { bash },
    stopWhen: stepCountIs(40),
    maxOutputTokens: 4096,
    messages,
  };
  const result = mode === "stream" ? streamText(options) : await generateText(options);
  const text = await result.text;
  messages.push(...(await result.responseMessages));
  console.log(`ANSWER: ${text}`);
}
