"""Generate the story writer's reference library: a deterministic `StoryCorpus` of a given size.

    python -m scenarios.story_writer.generate_corpus [--chars N] [--seed S] [--out DIR]

The book is 《灯塔守夜人》: the grandfather 林守义 kept the lighthouse of 雾港 from 1948 to 1988
and a logbook in blue ink. The corpus is his world: the town's people (the three characters
of characters.md, then townsfolk), its places, a timeline of its storms and ships, fixed facts
(continuity.md's, as keyword -> fact), and the logbook itself. The logbook grows until the
rendered corpus (`StoryCorpus.render()`) reaches `chars` characters, so the size is one
setting: the system prompt carries the whole corpus (seed 002's long prompt synthesis).

Same `chars` and `seed`, same corpus, byte for byte: nothing depends on the clock, the
platform or a hash seed. On the embedded model (SmolLM2's tokenizer) a Chinese character is
about 1.7 tokens; `DEFAULT_CHARS` makes the story writer's system prompt and tool schemas
fill most of its 8K context (README "Story writer" has the measured count). `--out` writes the
corpus as Markdown files (one per section) for reading; the scenario never reads them.
"""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from tools.story_library import Character, Fact, Location, LogEntry, StoryCorpus, TimelineEvent

DEFAULT_CHARS = 2200
_CHARS_PER_PERSON, _CHARS_PER_EVENT = 180, 240
ENV_CHARS = "ARBOR_STORY_CORPUS_CHARS"
FIRST_YEAR, LAST_YEAR = 1948, 1988

_DIGITS = "〇一二三四五六七八九"

_CORE = (
    Character("林澈", 28, "前城市建筑师，祖父的孙子", "沉默、细心，左手有旧伤，怕黑但从不承认",
              "祖父去世后回到雾港接手灯塔。"),
    Character("苏晚", 25, "渔民之女，海燕号船长的女儿", "说话直接，会修船用柴油机，随身带一把黄铜罗盘",
              "罗盘是父亲送的；海燕号在雾夜失联后来灯塔求助。"),
    Character("林守义", 82, "灯塔守夜人（已故）", "寡言，守时，写日志用蓝色墨水",
              "一九四八年到一九八八年守了四十年灯塔，日志最后一页被撕掉。"),
)
_SURNAMES = "周陈吴郑王冯何许蔡潘杜曾"
_GIVEN = ("海生", "秀兰", "阿水", "德明", "玉珍", "长根", "春花", "立新", "桂芳", "国栋", "小满", "望潮")
_ROLES = ("卖鱼的摊主", "邮递员", "小学老师", "药铺掌柜", "气象站观测员", "修船匠", "渡船船工", "妈祖庙的看守",
          "罐头厂女工", "退休的引水员", "码头搬运工", "杂货铺老板")
_TRAITS = ("爱打听消息", "嗓门大，心软", "记性极好", "不信天气预报", "总在抽旱烟", "说话带外地口音",
           "怕水却一辈子住在海边", "手很巧", "欠过祖父一个人情", "年轻时出过远海")

_PLACES = (
    Location("灯塔", "北岬尽头的白色圆塔，高二十一米，灯室里是手摇发电机和一盏旋转透镜灯"),
    Location("码头", "雾港唯一的码头，石砌，退潮时露出长满牡蛎的桩基"),
    Location("石板路", "从码头通往灯塔的唯一道路，一百二十级台阶"),
    Location("鱼市", "码头边的棚子，清晨四点开市，卖完就散"),
    Location("气象站", "东堤上的小平房，每天三次挂风球"),
    Location("旧船坞", "废弃的木船坞，海燕号曾在这里大修"),
    Location("礁石滩", "灯塔下方的暗礁区，雾天最危险"),
    Location("妈祖庙", "半山腰的小庙，出海前渔民来上香"),
    Location("邮局", "镇上唯一的邮局，兼卖船票"),
    Location("东堤", "挡浪的长堤，尽头有一盏红色的小灯"),
)
_SHIPS = ("海燕号", "顺风号", "红星号", "渔丰号", "闽渔七号", "长青号", "金鲳号")
_WEATHER = ("雾", "大雾", "晴", "阴", "小雨", "大风", "台风过境", "雾转晴", "浪高", "无风")
_WINDS = ("东北风", "东风", "东南风", "南风", "西南风", "西风", "西北风", "北风")
_LAMP = ("七点点灯", "发电机摇了两刻钟", "换了一根灯芯", "透镜上结了盐，擦了三遍", "灯亮到天明",
         "齿轮加了油", "雾大，加打雾号", "灯室玻璃裂了一道缝")
_DEEDS = ("{ship}归港，{person}在码头挥手", "{ship}出海，说是去北边渔场", "{ship}发来信号，两短一长",
          "{person}送来一篮鱼，说是谢礼", "{person}上塔来坐，说起{ship}的船长", "夜里听见{ship}的汽笛，没有看见灯",
          "{person}问起去年的那场风暴", "在{place}捡到一块船板，像是{ship}的", "{person}来借煤油",
          "{place}那边有人放焰火")
_EVENTS = ("台风过境，{place}受损，{ship}在港外避风", "{ship}在{place}附近触礁，船员全部获救", "{place}重修",
           "{ship}下水，全镇去{place}看", "雾季比往年长一个月，{ship}三次迷航", "{person}在{place}开了店",
           "灯塔换了新透镜，{person}帮忙抬上塔", "{ship}失踪七天后自己回来了")


def chinese_number(value: int) -> str:
    """Digits as Chinese numerals, as dates are written in the logbook (1963 -> 一九六三)."""
    return "".join(_DIGITS[int(d)] for d in str(value))


def chinese_count(value: int) -> str:
    """1..99 as counted in Chinese (12 -> 十二, 26 -> 二十六), as months and days are written."""
    tens, ones = divmod(value, 10)
    return f"{_DIGITS[tens] if tens > 1 else ''}{'十' if tens else ''}{_DIGITS[ones] if ones else ''}"


def _townsfolk(rng: random.Random, count: int) -> list[Character]:
    people = []
    for i, surname in enumerate(_SURNAMES[:count]):
        given = _GIVEN[i]
        people.append(Character(f"{surname}{given}", rng.randint(30, 80), _ROLES[i % len(_ROLES)],
                                rng.choice(_TRAITS),
                                f"{chinese_number(rng.randint(FIRST_YEAR, LAST_YEAR))}年起常去灯塔。"))
    return people


def _timeline(rng: random.Random, people: list[Character], count: int) -> list[TimelineEvent]:
    events = [TimelineEvent(FIRST_YEAR, "灯塔", "林守义接手灯塔，开始写日志"),
              TimelineEvent(1987, "礁石滩", "十月，海燕号雾夜遇险，日志记下“三长一短”"),
              TimelineEvent(LAST_YEAR, "灯塔", "林守义离开灯塔，日志最后一页被撕掉")]
    for year in list(range(FIRST_YEAR + 3, LAST_YEAR - 1, 4))[:count]:
        place = rng.choice(_PLACES[1:]).name
        text = rng.choice(_EVENTS).format(place=place, ship=rng.choice(_SHIPS), person=rng.choice(people).name)
        events.append(TimelineEvent(year, place, text))
    return sorted(events, key=lambda e: e.year)


def _log_entry(rng: random.Random, people: list[Character]) -> tuple[tuple[int, int, int], LogEntry]:
    """A random day's entry, with its (year, month, day) to put the logbook in order."""
    year, month, day = rng.randint(FIRST_YEAR, LAST_YEAR), rng.randint(1, 12), rng.randint(1, 28)
    deed = rng.choice(_DEEDS).format(ship=rng.choice(_SHIPS), person=rng.choice(people).name,
                                     place=rng.choice(_PLACES).name)
    text = f"{rng.choice(_WEATHER)}，{rng.choice(_WINDS)}{rng.randint(1, 9)}级。{rng.choice(_LAMP)}。{deed}。"
    date = f"{chinese_number(year)}年{chinese_count(month)}月{chinese_count(day)}日"
    return (year, month, day), LogEntry(year, month, date, text)


_FACTS = (
    Fact("灯", "灯塔的灯每晚七点点亮，由手摇发电机供电。"),
    Fact("日志", "祖父的日志是蓝色墨水，最后一页被撕掉（第二章）。"),
    Fact("左手", "林澈的左手有旧伤，不能长时间摇发电机。"),
    Fact("罗盘", "苏晚的黄铜罗盘是她父亲（海燕号船长）送的。"),
    Fact("台阶", "雾港只有一条石板路通往灯塔，共一百二十级台阶。"),
    Fact("海燕号", "海燕号一九八七年十月雾夜遇险，信号是三长一短。"),
)


@lru_cache(maxsize=8)
def generate_corpus(chars: int = DEFAULT_CHARS, seed: int = 2) -> StoryCorpus:
    """The corpus whose rendering is at least `chars` characters long (its core alone, the three
    main characters, the places and the fixed facts, may be longer: a tiny `chars` still gives
    every section). Deterministic in (`chars`, `seed`)."""
    if chars < 0:
        raise ValueError(f"chars must not be negative, got {chars}")
    rng = random.Random(seed)
    # Townsfolk and timeline grow with the size too (up to all of them), so a small corpus is
    # small: tests run the embedded model on it.
    people = [*_CORE, *_townsfolk(rng, min(len(_SURNAMES), chars // _CHARS_PER_PERSON))]
    timeline = _timeline(rng, people, chars // _CHARS_PER_EVENT)
    corpus = StoryCorpus("灯塔守夜人", tuple(people), _PLACES, tuple(timeline), (), _FACTS, (300, 600))
    entries: list[tuple[tuple[int, int, int], LogEntry]] = []
    size = len(corpus.render())
    while size < chars:
        day, entry = _log_entry(rng, people)
        entries.append((day, entry))
        size += len(f"\n- {entry.date}：{entry.text}")
    logbook = tuple(entry for _, entry in sorted(entries, key=lambda pair: pair[0]))
    return replace(corpus, logbook=logbook)


def corpus_chars_setting() -> int:
    """ARBOR_STORY_CORPUS_CHARS, else DEFAULT_CHARS; a value that is no whole number >= 0 is
    refused with a message naming the variable."""
    raw = os.environ.get(ENV_CHARS, "").strip()
    if not raw:
        return DEFAULT_CHARS
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{ENV_CHARS} must be a whole number of characters (0 or more), got {raw!r}")
    return value


def write_corpus(corpus: StoryCorpus, out: Path) -> list[Path]:
    """The corpus as one Markdown file per section under `out` (for reading, not used by the app)."""
    out.mkdir(parents=True, exist_ok=True)
    sections = corpus.render().split("\n## ")
    paths = []
    for i, section in enumerate(sections[1:], start=1):
        path = out / f"{i:02d}.md"
        path.write_text(f"## {section}\n", encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=DEFAULT_CHARS, help=f"corpus size (default {DEFAULT_CHARS})")
    parser.add_argument("--seed", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write the corpus as Markdown files here")
    args = parser.parse_args(argv)
    corpus = generate_corpus(args.chars, args.seed)
    print(f"{len(corpus.render())} characters: {len(corpus.characters)} characters, {len(corpus.locations)} "
          f"locations, {len(corpus.timeline)} timeline events, {len(corpus.logbook)} logbook entries")
    for path in write_corpus(corpus, args.out) if args.out else []:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
