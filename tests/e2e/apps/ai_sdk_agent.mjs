// An app built on the Vercel AI SDK (`ai` with `@ai-sdk/openai`): a shell agent over OpenAI's
// Responses API, in two user turns, each a multi-step tool loop. Its second turn sends the
// first turn's answer back as an `item_reference` (the SDK's default while `store` is on).
//
//   AI_SDK_MODULES=<node_modules> node ai_sdk_agent.mjs <base URL> <key> <model> whole|stream
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

const [baseURL, apiKey, model, mode] = process.argv.slice(2);
const openai = createOpenAI({ baseURL, apiKey });
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
  const options = { model: openai.responses(model), tools: { bash }, stopWhen: stepCountIs(40), messages };
  const result = mode === "stream" ? streamText(options) : await generateText(options);
  const text = await result.text;
  messages.push(...(await result.responseMessages));
  console.log(`ANSWER: ${text}`);
}
